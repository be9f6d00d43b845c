"""Line-by-line NumPy ports of the WIP kernels of kernels/conv_dft.cu
(dft_rows_forward, dft_rows_inverse, dft_filter_spectrum) against the cuBLAS path:
checks their index arithmetic without a GPU.  PYTHONPATH=. python notes/conv_large_emulate.py"""
import numpy as np
from dnnprims.algos import dft as D, fft as F
rng=np.random.default_rng(1)
def rows_forward(a, dw, NB,J,Hi,Wi,h):
    W=min(16,max(4,-(-h//4)))   # helper dft7: warps a block
    dpitch=2*(-(-h//4)*4); xpitch=Wi|1
    out=np.full(2*Hi*h*NB*J, np.nan)
    for bx in range(-(-J//64)):
      for r in range(Hi):
        for nb in range(NB):
          c0=bx*64
          dws=np.full(Wi*dpitch,np.nan); xs=np.full(64*xpitch,np.nan)
          for warp in range(W):      # helper dft7: a warp a row, lanes along it
            for lane in range(32):
              for col in range(warp,Wi,W):
                for k in range(lane,dpitch,32): dws[col*dpitch+k]=dw.flat[col*2*h+k] if k<2*h else 0
              for cc in range(warp,64,W):
                c=c0+cc; row=((nb*J+(c if c<J else 0))*Hi+r)*Wi
                for col in range(lane,Wi,32): xs[cc*xpitch+col]=a.flat[row+col] if c<J else 0
          for tid in range(32*W):
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
              v0+=4*W
    return out.view(np.complex128).reshape(Hi*h, NB*J)
def rows_inverse(y, dwi, B,n0,n1,h):
    # helper large2: the 2-vector version (two q a thread, (re, im) pairs in shared memory)
    yv=y.reshape(-1)                       # complex: one V a value
    dwi=dwi.reshape(-1)
    out=np.full(B*n0*n1,np.nan)
    for bx in range(-(-B//32)):
      for p in range(n0):
        b0=bx*32
        ys=np.zeros(32*h,complex); ds=np.full(h*n1,np.nan,complex)
        for i in range(32*h):
            v,bb=i>>5,i&31; b=b0+bb
            ys[i]=yv[(p*h+v)*B+b] if b<B else 0
        for warp in range(8):        # helper dft7: a warp a frequency, lanes along q
          for lane in range(32):
            for v in range(warp,h,8):
              for q in range(lane,n1,32):
                ds[v*n1+q]=dwi[(2*v)*n1+q]+1j*dwi[(2*v+1)*n1+q]
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
for (NB,J,Hi,Wi,T1,pad) in [(1,3,2,9,69,5),(1,2,1,3,3,1),(1,65,1,4,40,0)]:
    h=T1//2+1
    a=rng.standard_normal((NB,J,Hi,Wi)); DW=D._forward_w(Wi,pad,T1,False)
    ref=np.ascontiguousarray((a.reshape(-1,Wi)@DW).view(np.complex128).reshape(NB*J,Hi*h).T)
    print("fwd h =", h, np.abs(rows_forward(a,DW,NB,J,Hi,Wi,h)-ref).max())
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
def emu(f, ds, dr, h,E0,E1,J,Ko,d0,d1,flip,T0,rows=2,npairs=128):
    # helper dft7: offset table once a block, warp-per-pair staging, rows u = by, by + gy, ..
    sk,sj,sr,ss=[s//f.itemsize for s in f.strides]
    if flip: sk,sj=sj,sk
    ff=f.reshape(-1) if f.flags.c_contiguous else None
    taps=E0*E1; pitch=taps|1; pairs=J*Ko
    SMAX=next(m for m in (8,12,16,32) if E1<=m)
    G=np.full(T0*h*pairs,np.nan,complex)
    gy=-(-T0//rows)
    dsf=ds.reshape(-1); drf=dr.reshape(-1)
    for by in range(gy):
      for bx in range(-(-pairs//npairs)):
        jk0=bx*npairs
        gs=np.full(npairs*pitch,np.nan)
        offs=np.full(taps,-7)
        for tap in range(taps):
          r=tap//E1; s=tap-r*E1
          rr=E0-1-r if flip else r; sv=E1-1-s if flip else s
          offs[tap]=(rr//d0)*sr+(sv//d1)*ss if (rr%d0==0 and sv%d1==0) else -1
        warps=npairs//32
        bases=[((jk0+t)%Ko)*sk+((jk0+t)//Ko)*sj if jk0+t<pairs else -1 for t in range(npairs)]
        for warp in range(warps):      # helper dft7: 8 pairs a batch, lanes along taps
          for lane in range(32):
            for tap0 in range(0,taps,32):
              tap=tap0+lane
              o=offs[tap] if tap<taps else -1
              for p0 in range(warp,npairs,8*warps):
                val=[]
                for q in range(8):
                  pair=p0+q*warps
                  base=bases[pair] if pair<npairs else -1
                  val.append(ff[base+o] if (base>=0 and o>=0) else 0.0)
                for q in range(8):
                  pair=p0+q*warps
                  if pair<npairs and tap<taps: gs[pair*pitch+tap]=val[q]
        for t in range(npairs):
          jk=jk0+t
          if jk>=pairs: continue
          for u in range(by,T0,gy):
            b=np.zeros(SMAX,complex)
            for r in range(E0):
              c=drf[u*E0+r]
              for s in range(SMAX):
                if s<E1: b[s]+=c*gs[t*pitch+r*E1+s]
            for v in range(h):
              acc=0j
              for s in range(SMAX):
                if s<E1: acc+=dsf[v*E1+s]*b[s]
              G[u*h*pairs+jk+v*pairs]=acc
    return G.reshape(T0*h,J,Ko)
for (K,C,R,S,d,flip,T) in [(3,2,3,4,(1,1),0,(6,7)),(3,2,3,3,(2,1),1,(8,6)),(2,4,2,3,(1,2),1,(5,9)),(13,11,2,2,(1,1),0,(4,5)),(2,3,3,11,(1,1),1,(5,13))]:
    f=rng.standard_normal((K,C,R,S))
    E=(d[0]*(R-1)+1,d[1]*(S-1)+1)
    J,Ko=(K,C) if flip else (C,K)
    Ds,Dr=F._twiddle_matrices(np,T,E,np.complex128)
    wc=np.empty((E[0],E[1],J,Ko),complex)
    F._emulate_filter_complex(f,wc,d,flip,flip)
    ref=F._filter_dft(np,wc,Ds,Dr)
    for rows,npairs in ((1,128),(2,128),(2,64),(1,32)):
        got=emu(f,Ds,Dr,T[1]//2+1,E[0],E[1],J,Ko,d[0],d[1],flip,T[0],rows,npairs)
        print('filter', rows, npairs, np.abs(got-ref).max())
