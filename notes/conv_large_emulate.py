"""Line-by-line NumPy ports of the WIP kernels of kernels/conv_dft.cu
(dft_rows_forward, dft_rows_inverse, dft_filter_spectrum) against the cuBLAS path:
checks their index arithmetic without a GPU.  PYTHONPATH=. python notes/conv_large_emulate.py"""
import numpy as np
from dnnprims.algos import dft as D, fft as F
rng=np.random.default_rng(1)
def rows_forward(a, dw, NB,J,Hi,Wi,h):
    dpitch=2*(-(-h//4)*4); xpitch=Wi|1
    out=np.full(2*Hi*h*NB*J, np.nan)
    for bx in range(-(-J//64)):
      for r in range(Hi):
        for nb in range(NB):
          c0=bx*64
          dws=np.zeros(Wi*dpitch); xs=np.zeros(64*xpitch)
          for i in range(Wi*dpitch):
              col,k=divmod(i,dpitch); dws[i]=dw.flat[col*2*h+k] if k<2*h else 0
          for i in range(64*Wi):
              cc,col=divmod(i,Wi); c=c0+cc
              xs[cc*xpitch+col]=a.flat[((nb*J+c)*Hi+r)*Wi+col] if c<J else 0
          for tid in range(256):
            lane,warp=tid&31,tid>>5
            v0=4*warp
            while v0<h:
              re0=np.zeros(4);im0=np.zeros(4);re1=np.zeros(4);im1=np.zeros(4)
              for col in range(Wi):
                x0=xs[lane*xpitch+col]; x1=xs[(lane+32)*xpitch+col]
                d=dws[col*dpitch+2*v0: col*dpitch+2*v0+8]
                assert len(d)==8
                for u in range(4):
                  re0[u]+=x0*d[2*u]; im0[u]+=x0*d[2*u+1]; re1[u]+=x1*d[2*u]; im1[u]+=x1*d[2*u+1]
              for u in range(4):
                v=v0+u; base=((r*h+v)*NB+nb)*J
                if v<h and c0+lane<J: out[2*(base+c0+lane)]=re0[u]; out[2*(base+c0+lane)+1]=im0[u]
                if v<h and c0+32+lane<J: out[2*(base+c0+32+lane)]=re1[u]; out[2*(base+c0+32+lane)+1]=im1[u]
              v0+=32
    return out.view(np.complex128).reshape(Hi*h, NB*J)
def rows_inverse(y, dwi, B,n0,n1,h):
    # helper large2: the 2-vector version (two q a thread, (re, im) pairs in shared memory)
    yv=y.reshape(-1)                       # complex: one V a value
    dwi=dwi.reshape(-1)
    out=np.full(B*n0*n1,np.nan)
    for bx in range(-(-B//32)):
      for p in range(n0):
        b0=bx*32
        ys=np.zeros(32*h,complex); ds=np.zeros(h*n1,complex)
        for i in range(32*h):
            v,bb=i>>5,i&31; b=b0+bb
            ys[i]=yv[(p*h+v)*B+b] if b<B else 0
        for i in range(h*n1):
            v=i//n1; q=i-v*n1
            ds[i]=dwi[(2*v)*n1+q]+1j*dwi[(2*v+1)*n1+q]
        for tid in range(256):
          lane,warp=tid&31,tid>>5
          for q0 in range(0,n1,64):
            qa,qb=q0+lane,q0+32+lane
            ca=qa if qa<n1 else n1-1; cb=qb if qb<n1 else n1-1
            acca=np.zeros(4); accb=np.zeros(4)
            for v in range(h):
              da,db=ds[v*n1+ca],ds[v*n1+cb]
              for u in range(4):
                yy=ys[v*32+warp+8*u]
                acca[u]+=yy.real*da.real+yy.imag*da.imag
                accb[u]+=yy.real*db.real+yy.imag*db.imag
            for u in range(4):
              b=b0+warp+8*u
              if b<B:
                if qa<n1: out[(b*n0+p)*n1+qa]=acca[u]
                if qb<n1: out[(b*n0+p)*n1+qb]=accb[u]
    return out.reshape(B,n0,n1)
NB,J,Hi,Wi,T1,pad=2,70,3,5,7,2
h=T1//2+1
a=rng.standard_normal((NB,J,Hi,Wi)); DW=D._forward_w(Wi,pad,T1,False)
A1=(a.reshape(-1,Wi)@DW).view(np.complex128)
ref=np.ascontiguousarray(A1.reshape(NB*J,Hi*h).T)
got=rows_forward(a,DW,NB,J,Hi,Wi,h)
print("fwd", np.abs(got-ref).max())
B,n0,n1,T0=40,3,6,5
h=T1//2+1
Yp=rng.standard_normal((n0,h*B))+1j*rng.standard_normal((n0,h*B))
DWi=D._inverse_w(n1,T1,1.0)
Ypt=np.ascontiguousarray(Yp.reshape(n0*h,B).T)
ref=(Ypt.view(np.float64).reshape(B*n0,2*h)@DWi).reshape(B,n0,n1)
got=rows_inverse(Yp,DWi,B,n0,n1,h)
print("inv", np.abs(got-ref).max())
NB,J,Hi,Wi,T1,pad=1,2,1,3,66,1
h=T1//2+1
a=rng.standard_normal((NB,J,Hi,Wi)); DW=D._forward_w(Wi,pad,T1,False)
ref=np.ascontiguousarray((a.reshape(-1,Wi)@DW).view(np.complex128).reshape(NB*J,Hi*h).T)
print("fwd big h", np.abs(rows_forward(a,DW,NB,J,Hi,Wi,h)-ref).max())
B,n0,n1,T1=3,1,40,5
h=T1//2+1
Yp=rng.standard_normal((n0,h*B))+1j*rng.standard_normal((n0,h*B))
DWi=D._inverse_w(n1,T1,1.0)
Ypt=np.ascontiguousarray(Yp.reshape(n0*h,B).T)
ref=(Ypt.view(np.float64).reshape(B*n0,2*h)@DWi).reshape(B,n0,n1)
print("inv big n1", np.abs(rows_inverse(Yp,DWi,B,n0,n1,h)-ref).max())
B,n0,n1,T1=33,2,70,9
h=T1//2+1
Yp=rng.standard_normal((n0,h*B))+1j*rng.standard_normal((n0,h*B))
DWi=D._inverse_w(n1,T1,1.0)
Ypt=np.ascontiguousarray(Yp.reshape(n0*h,B).T)
ref=(Ypt.view(np.float64).reshape(B*n0,2*h)@DWi).reshape(B,n0,n1)
print("inv n1 > 64, ragged B", np.abs(rows_inverse(Yp,DWi,B,n0,n1,h)-ref).max())

rng=np.random.default_rng(2)
def emu(f, ds, dr, h,E0,E1,J,Ko,d0,d1,flip,T0):
    # helper large2: the staged version (128 pairs a block, taps in shared memory, pitch taps | 1)
    sk,sj,sr,ss=[s//f.itemsize for s in f.strides]
    if flip: sk,sj=sj,sk
    ff=f.reshape(-1) if f.flags.c_contiguous else None
    taps=E0*E1; pitch=taps|1; pairs=J*Ko
    G=np.full(T0*h*pairs,np.nan,complex)
    for u in range(T0):
      for bx in range(-(-pairs//128)):
        jk0=bx*128
        gs=np.full(128*pitch,np.nan)
        for i in range(128*taps):
          pair=i//taps; tap=i-pair*taps; r=tap//E1; s=tap-r*E1; jk=jk0+pair; value=0.0
          if jk<pairs:
            k,j=jk%Ko,jk//Ko
            rr=E0-1-r if flip else r; sv=E1-1-s if flip else s
            if rr%d0==0 and sv%d1==0: value=ff[k*sk+j*sj+(rr//d0)*sr+(sv//d1)*ss]
          gs[pair*pitch+tap]=value
        for t in range(128):
          jk=jk0+t
          if jk>=pairs: continue
          b=np.zeros(32,complex)
          for r in range(E0):
            for s in range(min(E1,32)):
              b[s]+=dr[u,r]*gs[t*pitch+r*E1+s]
          for v in range(h):
            G[u*h*pairs+jk+v*pairs]=sum(ds[v,s]*b[s] for s in range(E1))
    return G.reshape(T0*h,J,Ko)
for (K,C,R,S,d,flip,T) in [(3,2,3,4,(1,1),0,(6,7)),(3,2,3,3,(2,1),1,(8,6)),(2,4,2,3,(1,2),1,(5,9)),(13,11,2,2,(1,1),0,(4,5))]:
    f=rng.standard_normal((K,C,R,S))
    E=(d[0]*(R-1)+1,d[1]*(S-1)+1)
    J,Ko=(K,C) if flip else (C,K)
    Ds,Dr=F._twiddle_matrices(np,T,E,np.complex128)
    wc=np.empty((E[0],E[1],J,Ko),complex)
    F._emulate_filter_complex(f,wc,d,flip,flip)
    ref=F._filter_dft(np,wc,Ds,Dr)
    got=emu(f,Ds,Dr,T[1]//2+1,E[0],E[1],J,Ko,d[0],d[1],flip,T[0])
    print(np.abs(got-ref).max())
